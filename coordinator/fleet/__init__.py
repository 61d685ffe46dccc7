"""Who is out there: the agent registry, enrollment, client certificates, selection, privacy budgets."""
