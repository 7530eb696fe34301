"""Source text shared by the tests' child scripts (run by the `run_python` fixture)."""

# A stand-in for Numba's Context and Device: the plugin reads the device's id and PCI
# identity and keeps a weak reference to the context, nothing more, so its CPU tests need
# no GPU. Indented by four spaces like the scripts it is pasted into (they are dedented).
NUMBA_CONTEXT = """
    class Device:
        id = 0
        def get_device_identity(self):
            return {"pci_domain_id": 0, "pci_bus_id": 0, "pci_device_id": 0}

    class Context:
        device = Device()

    ctx = Context()
"""
