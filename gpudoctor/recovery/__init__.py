"""Verified return to service (issue #31): the recovery ladder and the active verification."""
