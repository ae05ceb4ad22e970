module raftmqbench/grpc_pub

go 1.24

require (
	google.golang.org/grpc v1.72.2
	google.golang.org/protobuf v1.36.12
	raftmqbench/report v0.0.0
)

require (
	golang.org/x/net v0.35.0 // indirect
	golang.org/x/sys v0.30.0 // indirect
	golang.org/x/text v0.22.0 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20250218202821-56aae31c358a // indirect
)

replace raftmqbench/report => ../gopath/src/raftmqbench/report
