"""Trainer integrations of tuneup, installed as `tuneup.plugins`.

Each integration is a thin adapter: it turns a trainer's events into calls on `tuneup.collect` and
`tuneup.record`, and does no analysis of its own.
"""
