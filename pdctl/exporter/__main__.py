from pdctl.exporter.command import main

main()
