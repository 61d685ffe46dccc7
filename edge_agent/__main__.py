from edge_agent.cli import main

main()
