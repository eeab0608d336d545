// Command hello writes hello: the program TestBuild builds.
package main

import "fmt"

func main() { fmt.Println("hello") }
