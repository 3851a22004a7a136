"""The command-line apps built on the library: ``feedmux`` (:mod:`.cli`), the demo
(:mod:`.demo`) and the live view ``feedmux top`` (:mod:`.top`).

They use the public API and the statistics pages; the library never imports them.
"""
