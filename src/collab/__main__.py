from collab.fit import main

raise SystemExit(main())
