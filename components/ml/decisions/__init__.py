"""Decisions on evidence: paired quality gates, the blessing against the champion, judging a
challenger on live traffic, scoring, and the monitor's drift and live-accuracy checks."""
