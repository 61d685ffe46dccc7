# edgefl broker ACL for Mosquitto 2.x.
#
# Every client authenticates with a username, and mosquitto.conf sets
# use_username_as_clientid, so %c below is the username: for an agent, its agent id.
# No client can take another's id, so no agent can publish as another one.

# The coordinator: reads agents' status and updates; writes its status (and last will),
# round announcements and global states.
user {{ .Values.broker.username }}
topic read fl/+/agents/+/status
topic read fl/+/updates/#
topic write fl/+/coordinator/status
topic write fl/+/rounds/current
topic write fl/+/global/#

# Everyone, agents included: its own status (and last will) and its own updates; reading
# what the coordinator publishes. Nothing else: no agent sees another agent's update.
pattern write fl/+/agents/%c/#
pattern write fl/+/updates/%c/#
pattern read fl/+/coordinator/status
pattern read fl/+/rounds/current
pattern read fl/+/global/#
