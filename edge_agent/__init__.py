"""The device side: profiles, models, data, local training, DP, and the MQTT loop."""
