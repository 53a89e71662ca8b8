"""Cost: what a run's hardware costs per hour (`pricing`), and the report's money, MFU and energy
figures (`figures`).

Pure functions over a loaded run and the packaged catalogs (tuneup.catalog); no torch or Lightning
import (reports are made on machines without them).
"""
