"""What a RocketMQ client and broker both speak: the CommitLog message codec, msgIds and
the request headers. Both sides import it; it imports neither."""
