"""Wire protocol v1 of feedmux (sans-IO: objects to frames and back; never imports zmq)."""
