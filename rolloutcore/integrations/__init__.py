"""Adoption glue for the trainers RL teams already run (TRL)."""
