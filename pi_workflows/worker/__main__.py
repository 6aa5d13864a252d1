import sys

if "--zygote" in sys.argv[1:]:
    from .zygote import serve

    sys.exit(serve())

from .main import main

sys.exit(main())
