"""Learned drafts that read the target's hidden states: Medusa heads and EAGLE heads."""
