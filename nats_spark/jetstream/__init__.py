"""JetStream pieces nats-py lacks: raw API requests (`api`), status messages and pulls (priority
groups). The package imports none of them, so that parsing options (`subject_names`) does not
import nats-py."""
