#!/bin/sh
# The lab broker's start-up: write Mosquitto's password file (one entry per client named in
# LAB_CLIENTS, all with LAB_BROKER_PASSWORD), then run Mosquitto in its place.
# Lab only: one shared password. The ACL still pins each username to its own topics.
set -eu
: "${LAB_BROKER_PASSWORD:?set LAB_BROKER_PASSWORD (see deploy/compose/lab.env.example)}"
: "${LAB_CLIENTS:?set LAB_CLIENTS: the coordinator user and every agent id}"
passwd="${MOSQUITTO_PASSWD_FILE:-/mosquitto/data/passwd}"

umask 077
: > "$passwd"
for client in $LAB_CLIENTS; do
    mosquitto_passwd -b "$passwd" "$client" "$LAB_BROKER_PASSWORD"
done
# As root (the image's default), Mosquitto drops to its own user, which must own the file.
if [ "$(id -u)" = 0 ] && id mosquitto > /dev/null 2>&1; then
    chown mosquitto:mosquitto "$passwd"
fi
exec mosquitto -c "${MOSQUITTO_CONFIG:-/mosquitto/config/mosquitto.conf}"
