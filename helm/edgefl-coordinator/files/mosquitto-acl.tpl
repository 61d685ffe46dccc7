# edgefl broker ACL for Mosquitto 2.x.
#
# Every client authenticates, with a password or a client certificate. mosquitto.conf sets
# use_username_as_clientid on every listener (and use_identity_as_username where clients
# present certificates), so %c below is the username: for an agent, its agent id (with
# certificates, the certificate's CN). No client can take another's id, so no agent can
# publish as another one.
#
# Every line is pinned to one federation, here "default", so an agent cannot write into
# another federation's topics either. For your federation, replace fl/default/ on every
# line that is not a comment, e.g. for federation greenhouse:
#   sed '/^#/!s#fl/default/#fl/greenhouse/#' acl > acl.greenhouse
# A broker shared by several federations needs one copy of these lines per federation
# (each with its coordinator's user line); the Helm chart fills in its own federation.

# The coordinator: reads agents' status and updates, their secure-aggregation stages, and site
# aggregators' partials and rosters (sites, docs/deploying-sites.md); writes its status (and last
# will), the run's task card, round announcements, global states, refusal notices, the secure
# rounds' relays and share inboxes, and its resync requests to sites.
user {{ .Values.broker.username }}
topic read fl/{{ .Values.federation }}/agents/+/status
topic read fl/{{ .Values.federation }}/updates/#
topic read fl/{{ .Values.federation }}/secagg/#
topic write fl/{{ .Values.federation }}/secagg_relay/#
topic write fl/{{ .Values.federation }}/secagg_inbox/#
topic read fl/{{ .Values.federation }}/sites/+/partials/#
topic read fl/{{ .Values.federation }}/sites/+/roster
topic write fl/{{ .Values.federation }}/coordinator/status
topic write fl/{{ .Values.federation }}/rounds/current
topic write fl/{{ .Values.federation }}/task
topic write fl/{{ .Values.federation }}/notices/#
topic write fl/{{ .Values.federation }}/global/#
topic write fl/{{ .Values.federation }}/sites/+/resync

# Everyone, agents included: its own status (and last will), its own updates and secure-aggregation
# stages; reading what the coordinator publishes (secure rounds' relays included), and the notices and
# share bundles addressed to itself. Nothing else: no agent sees another agent's update, masked input,
# notices or bundles.
pattern write fl/{{ .Values.federation }}/agents/%c/#
pattern write fl/{{ .Values.federation }}/updates/%c/#
pattern write fl/{{ .Values.federation }}/secagg/%c/#
pattern read fl/{{ .Values.federation }}/secagg_relay/#
pattern read fl/{{ .Values.federation }}/secagg_inbox/%c/#
pattern read fl/{{ .Values.federation }}/coordinator/status
pattern read fl/{{ .Values.federation }}/rounds/current
pattern read fl/{{ .Values.federation }}/task
pattern read fl/{{ .Values.federation }}/notices/%c
pattern read fl/{{ .Values.federation }}/global/#

# Sites (docs/deploying-sites.md#acls): each site broker's bridge logs in as its own user and
# carries the site's roster of its agents and its partials up, and what the coordinator
# publishes (all notices included, and its resync requests to the site) down. One block per site, e.g. for site farm-1:
#   user farm-1-bridge
#   topic read fl/default/coordinator/status
#   topic read fl/default/rounds/current
#   topic read fl/default/task
#   topic read fl/default/global/#
#   topic read fl/default/notices/#
#   topic read fl/default/sites/farm-1/resync
#   topic write fl/default/sites/farm-1/roster
#   topic write fl/default/sites/farm-1/partials/#
{{ range .Values.mosquitto.sites -}}
{{ printf "\nuser %s-bridge" .id }}
topic read fl/{{ $.Values.federation }}/coordinator/status
topic read fl/{{ $.Values.federation }}/rounds/current
topic read fl/{{ $.Values.federation }}/task
topic read fl/{{ $.Values.federation }}/global/#
topic read fl/{{ $.Values.federation }}/notices/#
topic read fl/{{ $.Values.federation }}/sites/{{ .id }}/resync
topic write fl/{{ $.Values.federation }}/sites/{{ .id }}/roster
topic write fl/{{ $.Values.federation }}/sites/{{ .id }}/partials/#
{{ end -}}
