"""Cost: what a run's hardware costs per hour (`pricing`), and what a report is priced with (`options`:
the command line's price, else the run's recorded one). The money, MFU and energy figures built on them
are part of the analysis (tuneup.analyze.cost): this layer sits below it and never imports it.

Pure functions over a loaded run and the packaged catalogs (tuneup.catalog); no torch or Lightning
import (reports are made on machines without them).
"""
