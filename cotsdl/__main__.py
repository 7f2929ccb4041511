from .cli import main, stop_on_signals

stop_on_signals()  # first: a SIGTERM while the program starts ends with a message, not a bare status
raise SystemExit(main())
