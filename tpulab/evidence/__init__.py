"""What proves a run: the receipt model and checks (`receipt`), the one judgement of raw
receipt bytes (`judge`), the store that keeps receipts (`store`), the local reference run
(`localrun`) and receipt reports as data (`report`).
"""
