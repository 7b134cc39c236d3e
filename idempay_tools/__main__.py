from idempay_tools.cli import main

main()
