"""Providers behind one interface (`ChatProvider`), each speaking its real wire format."""
