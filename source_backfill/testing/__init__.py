"""Helpers for testing pipelines (and this service) against a real daemon process."""
