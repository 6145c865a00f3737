"""Audit: the audit log and the recorder the services write through."""
