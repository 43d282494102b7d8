package clients

// The client TestWalkthrough/GeneratedClient generates from the OpenAPI
// document needs oapi-codegen's runtime; importing it here keeps it in
// go.mod (go mod tidy does not look into testdata).
import _ "github.com/oapi-codegen/runtime"
