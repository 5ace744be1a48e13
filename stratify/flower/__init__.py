"""Stratify and its baselines on Flower's Message API (``pip install -e '.[flower]'``).

* :mod:`stratify.flower.node`: the ``ClientApp`` every node runs, holding one client's data;
* :mod:`stratify.flower.server`: :func:`~stratify.flower.server.run_on_grid`, the server
  app's loop: the in-process engine whose clients' work travels as Flower messages;
* :mod:`stratify.flower.simulation`: :func:`~stratify.flower.simulation.simulate`, the
  same in Flower's simulation runtime;
* :mod:`stratify.flower.apps`: the ``ServerApp`` and ``ClientApp`` a deployment loads
  (``examples/flower/``); :mod:`stratify.flower.deploy`: a SuperLink and SuperNodes on
  this machine.

docs/flower.md says how to run each and what every party sees.
"""
