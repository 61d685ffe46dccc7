from coordinator.app.cli import main

main()
