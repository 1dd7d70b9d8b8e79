"""toolfleet's extensions of Celery, kombu and billiard on the worker.

::

    transport.py   kombu's Redis transport: bad entries dropped, deliveries held under a lease
    lease.py       worker leases: a lost worker's calls back on their queues within seconds
    fence.py       which attempt of a handed-on call may start it and store its result
    backend.py     Celery's Redis result backend: fenced stores, reply-channel publishing
    consumer.py    Celery's consumer: every message checked before Celery reads it
    envelope.py    the checks a task message passes
    redaction.py   what Flower and the logs show of a call
    soft_limit.py  the soft time limit stops the tool, and only the tool
    event_loop.py  time limits on time while a cut holds up the event loop
    heartbeat.py   event heartbeats that never stall the event loop
"""
