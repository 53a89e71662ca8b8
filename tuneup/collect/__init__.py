"""Measurement: the step clock, the telemetry sampler and its sensors, batch sizing, the environment.

Everything here may import torch lazily; nothing here knows about Lightning.
"""
