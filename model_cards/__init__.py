"""Model card templates, installed as headedit.model_cards (see pyproject package-dir)."""
