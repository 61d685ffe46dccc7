"""Moving messages: the MQTT link and chunking for brokers that cap message size."""
