"""speccatalog: what specops chooses from, without torch: targets, hardware profiles, draft costs."""
