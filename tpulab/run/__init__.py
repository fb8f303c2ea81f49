"""One run: the lifecycle's phases and teardown (`lifecycle`, `teardown`), signals, the
dry-run plan (`plan`: the lifecycle over recording seams), progress events and the report.
"""
