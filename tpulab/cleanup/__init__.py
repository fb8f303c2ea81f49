"""After and around runs: the SQLite journal (`journal`), finding and deleting orphans
(`sweep`, for `teardown --verify`) and listing tpulab's nodes (`listing`).
"""
