"""The command-line apps built on the library: ``feedmux`` (:mod:`.cli`), the demo
(:mod:`.demo`), the live view ``feedmux top`` (:mod:`.top`) and the checker
``feedmux audit`` (:mod:`.audit`).

They use the public API and the statistics pages; the library never imports them.
"""
