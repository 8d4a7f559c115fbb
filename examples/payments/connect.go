package main

import (
	"context"
	"errors"

	"connectrpc.com/connect"
	"google.golang.org/grpc/status"

	"github.com/idemkit/idem/examples/grpc/gen/paymentsv1"
)

// connectServer is the Connect face of server (connect-go's generated
// interface has the same method names with its own types).
type connectServer struct{ s *server }

func (c connectServer) CreatePayment(ctx context.Context, req *connect.Request[paymentsv1.CreatePaymentRequest]) (*connect.Response[paymentsv1.Payment], error) {
	p, err := c.s.charge(ctx, req.Msg)
	if err != nil {
		return nil, connectError(err)
	}
	res := connect.NewResponse(p)
	res.Header().Set("Location", "/v1/payments/"+p.GetId())
	return res, nil
}

// connectError turns a gRPC status error into a Connect error with the same
// code, message and details.
func connectError(err error) error {
	st := status.Convert(err)
	ce := connect.NewError(connect.Code(st.Code()), errors.New(st.Message()))
	for _, a := range st.Proto().GetDetails() {
		if d, err := connect.NewErrorDetail(a); err == nil {
			ce.AddDetail(d)
		}
	}
	return ce
}
