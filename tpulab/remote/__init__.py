"""The VM side, from the laptop: SSH (`ssh`, the only paramiko importer), keys and host-key
pinning (`keys`), the venv bootstrap (`bootstrap`) and the payload command (`payload`).
"""
