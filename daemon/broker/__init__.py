"""The broker edge: the embedded nats-server, the VIGIL stream, the durable consumer and its pulls."""
