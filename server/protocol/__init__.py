"""The protocol's own data: wire types and their codec (`codec`) and request futures
(`futures`). Shared by every layer above; imports nothing else of `server`.
"""
