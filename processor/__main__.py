from processor.cli import main

raise SystemExit(main())
