"""Access: the caller's access context, the policy file, and graph access."""
