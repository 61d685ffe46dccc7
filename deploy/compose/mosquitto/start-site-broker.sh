#!/bin/sh
# A lab site broker's start-up: the password file (LAB_CLIENTS: the site aggregator's user and the
# site's agents, all with LAB_BROKER_PASSWORD), the site ACL (deploy/mosquitto/site-acl for site
# LAB_SITE_ID) and the bridge to the root broker LAB_ROOT_HOST (the topic lines of
# deploy/mosquitto/site-bridge.conf, logging in as LAB_SITE_ID-bridge), then Mosquitto in its place.
set -eu
: "${LAB_BROKER_PASSWORD:?set LAB_BROKER_PASSWORD (see deploy/compose/lab.env.example)}"
: "${LAB_CLIENTS:?set LAB_CLIENTS: the site aggregator user and the site agents ids}"
: "${LAB_SITE_ID:?set LAB_SITE_ID: this site id}"
: "${LAB_ROOT_HOST:?set LAB_ROOT_HOST: the root broker host}"
data="${MOSQUITTO_DATA_DIR:-/mosquitto/data}"
config="${MOSQUITTO_CONFIG_DIR:-/mosquitto/config}"
federation="${LAB_FEDERATION:-default}"

umask 077
: > "$data/passwd"
for client in $LAB_CLIENTS; do
    mosquitto_passwd -b "$data/passwd" "$client" "$LAB_BROKER_PASSWORD"
done
sed "/^#/!s#fl/default/#fl/$federation/#; /^#/!s#SITE_ID#$LAB_SITE_ID#g" "$config/site-acl" > "$data/acl"
# From site-bridge.conf, its bridge section (from "connection" on), filled in for this site.
sed -n '/^connection /,$p' "$config/site-bridge.conf" \
    | sed "s#FEDERATION#$federation#g; s#ROOT_HOST#$LAB_ROOT_HOST#g; s#SITE_ID#$LAB_SITE_ID#g" > "$data/bridge.conf"
printf 'remote_username %s-bridge\nremote_password %s\n' "$LAB_SITE_ID" "$LAB_BROKER_PASSWORD" >> "$data/bridge.conf"
cat "$config/mosquitto.conf" "$data/bridge.conf" > "$data/mosquitto.conf"
if [ "$(id -u)" = 0 ] && id mosquitto > /dev/null 2>&1; then
    chown mosquitto:mosquitto "$data/passwd" "$data/acl" "$data/bridge.conf" "$data/mosquitto.conf"
fi
exec mosquitto -c "$data/mosquitto.conf"
