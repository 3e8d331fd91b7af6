"""Training learned drafts (Medusa, EAGLE, distilled draft models) for a target model."""
