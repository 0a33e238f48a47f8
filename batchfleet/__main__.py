from batchfleet.cli import main

main()
