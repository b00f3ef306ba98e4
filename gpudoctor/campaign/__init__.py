"""Campaigns: the file (methods x TP x workloads x levels, FILE:LINE errors), the runner that gates the host and runs
each configuration, and the healer that resumes after the target changed."""
