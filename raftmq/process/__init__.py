"""What every server process shares: how it stops on a signal, how a command reports an error
in one line, its Prometheus endpoint, and the opt-in stage marks of `bench broker --stages`."""
