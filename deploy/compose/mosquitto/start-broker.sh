#!/bin/sh
# The lab's root broker start-up: write Mosquitto's password file (one entry per client named in
# LAB_CLIENTS, all with LAB_BROKER_PASSWORD) and its ACL (deploy/mosquitto/acl, plus one block per
# site in LAB_SITES for the site broker's bridge user SITE-bridge), then run Mosquitto in its place.
# Lab only: one shared password. The ACL still pins each username to its own topics.
set -eu
: "${LAB_BROKER_PASSWORD:?set LAB_BROKER_PASSWORD (see deploy/compose/lab.env.example)}"
: "${LAB_CLIENTS:?set LAB_CLIENTS: the coordinator user and every agent id}"
passwd="${MOSQUITTO_PASSWD_FILE:-/mosquitto/data/passwd}"
acl="${MOSQUITTO_ACL_FILE:-/mosquitto/data/acl}"
federation="${LAB_FEDERATION:-default}"

umask 077
: > "$passwd"
for client in $LAB_CLIENTS; do
    mosquitto_passwd -b "$passwd" "$client" "$LAB_BROKER_PASSWORD"
done
# A site's bridge: what the root publishes goes down, the site's roster of its agents and its own
# partials come up (docs/deploying-sites.md#acls).
cp "${MOSQUITTO_ACL_BASE:-/mosquitto/config/acl}" "$acl"
for site in ${LAB_SITES:-}; do
    mosquitto_passwd -b "$passwd" "$site-bridge" "$LAB_BROKER_PASSWORD"
    cat >> "$acl" <<ACL

user $site-bridge
topic read fl/$federation/coordinator/status
topic read fl/$federation/rounds/current
topic read fl/$federation/task
topic read fl/$federation/global/#
topic read fl/$federation/notices/#
topic read fl/$federation/sites/$site/resync
topic write fl/$federation/sites/$site/roster
topic write fl/$federation/sites/$site/partials/#
ACL
done
# As root (the image's default), Mosquitto drops to its own user, which must own the files.
if [ "$(id -u)" = 0 ] && id mosquitto > /dev/null 2>&1; then
    chown mosquitto:mosquitto "$passwd" "$acl"
fi
exec mosquitto -c "${MOSQUITTO_CONFIG:-/mosquitto/config/mosquitto.conf}"
