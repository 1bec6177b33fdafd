from processor.commands.main import main

raise SystemExit(main())
