import sys

from batch_ingest.reindex.cli import main

sys.exit(main())
