package idemrpc_test

import (
	"fmt"

	"github.com/idemkit/idem/adapters/idemrpc"
)

// An Outcome round trip: what a record holds for one unary call.
func ExampleOutcome() {
	in := idemrpc.Outcome{
		TypeName: "payments.v1.Payment",
		Message:  []byte{0x0a, 0x03, 'p', 'a', 'y'},
		Header:   []idemrpc.Entry{{Name: "location", Value: "/v1/payments/pay"}},
	}
	var out idemrpc.Outcome
	if err := out.Unmarshal(in.Marshal()); err != nil {
		fmt.Println(err)
	}
	fmt.Println(out.TypeName, len(out.Message), out.Header[0].Name, out.Status == nil)
	fmt.Println(out.Unmarshal([]byte{0xff}))
	// Output:
	// payments.v1.Payment 5 location true
	// idemrpc: stored response is not an RPC outcome
}

// The default store policy through the status table: FailedPrecondition
// (a declined card) is stored, Unavailable released.
func ExampleHTTPStatus() {
	fmt.Println(idemrpc.HTTPStatus(idemrpc.FailedPrecondition), idemrpc.HTTPStatus(idemrpc.Unavailable), idemrpc.HTTPStatus(idemrpc.AlreadyExists))
	// Output: 412 503 422
}
