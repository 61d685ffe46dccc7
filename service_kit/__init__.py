"""What both services share that is not wire contract: settings loading, CLI options, broker settings, durable files.

Imported by ``coordinator`` and ``edge_agent``; imports neither, nor torch."""
