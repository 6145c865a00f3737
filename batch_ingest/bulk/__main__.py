import sys

from batch_ingest.bulk.cli import main

sys.exit(main())
