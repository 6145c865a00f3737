"""HTTP plumbing: route dependencies, error answers, body limits and tracing."""
