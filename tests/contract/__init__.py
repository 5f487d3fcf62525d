"""The reader contract: behaviour written once (:mod:`tests.contract.base`) and run over
every reader of the format (:mod:`tests.contract.readers`), as zarr's ``StoreTests`` and
fsspec's ``tests/abstract/`` run one suite over every store and file system."""
