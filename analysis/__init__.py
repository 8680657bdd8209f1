"""Reading ActorQ results: run folders, tables, figures and the report (no training code)."""
