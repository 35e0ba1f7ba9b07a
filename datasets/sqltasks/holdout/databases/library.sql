-- A city library network: branches, members who belong to a home branch, the catalogue of
-- books, and loans of books to members (returned or not yet).
CREATE TABLE Branches (BranchId INTEGER PRIMARY KEY, BranchName VARCHAR NOT NULL, District VARCHAR NOT NULL, OpenedYear INTEGER NOT NULL);
CREATE TABLE Members (MemberId INTEGER PRIMARY KEY, HomeBranchId INTEGER NOT NULL REFERENCES Branches(BranchId), FirstName VARCHAR NOT NULL, LastName VARCHAR NOT NULL, JoinedOn DATE NOT NULL, IsStudent BOOLEAN NOT NULL);
CREATE TABLE Books (BookId INTEGER PRIMARY KEY, Title VARCHAR NOT NULL, Author VARCHAR NOT NULL, Genre VARCHAR NOT NULL, PublishedYear INTEGER NOT NULL, Pages INTEGER NOT NULL);
CREATE TABLE Loans (LoanId INTEGER PRIMARY KEY, BookId INTEGER NOT NULL REFERENCES Books(BookId), MemberId INTEGER NOT NULL REFERENCES Members(MemberId), BranchId INTEGER NOT NULL REFERENCES Branches(BranchId), LoanedOn DATE NOT NULL, ReturnedOn DATE, LateFee DECIMAL(6,2) NOT NULL);
INSERT INTO Branches VALUES
  (1, 'Central', 'Old Town', 1962),
  (2, 'Riverside', 'Harbour', 1988),
  (3, 'Northgate', 'Northgate', 2004),
  (4, 'Elm Park', 'Westfield', 2015);
INSERT INTO Members VALUES
  (1, 1, 'Amara', 'Okafor', DATE '2019-02-11', FALSE),
  (2, 1, 'Bruno', 'Santos', DATE '2021-09-03', TRUE),
  (3, 2, 'Chloe', 'Martin', DATE '2020-05-20', FALSE),
  (4, 2, 'Dev', 'Malhotra', DATE '2022-10-14', TRUE),
  (5, 3, 'Elena', 'Petrova', DATE '2018-07-01', FALSE),
  (6, 3, 'Farid', 'Haddad', DATE '2023-01-25', TRUE),
  (7, 4, 'Greta', 'Lund', DATE '2023-06-12', FALSE),
  (8, 1, 'Hiro', 'Tanaka', DATE '2024-03-08', TRUE),
  (9, 4, 'Isla', 'Murray', DATE '2021-12-30', FALSE);
INSERT INTO Books VALUES
  (1, 'The Salt Road', 'Mina Keller', 'history', 2011, 412),
  (2, 'Quiet Engines', 'Paul Adeyemi', 'science', 2019, 288),
  (3, 'Winter Orchard', 'Lena Voss', 'fiction', 2016, 344),
  (4, 'A Map of Tides', 'Lena Voss', 'fiction', 2021, 301),
  (5, 'Counting Stars', 'Omar Haddad', 'science', 2008, 196),
  (6, 'The Glass Council', 'Ruth Ebert', 'fiction', 1999, 520),
  (7, 'Bread and Stone', 'Mina Keller', 'history', 2017, 366),
  (8, 'Small Gardens', 'Ana Ruiz', 'home', 2022, 150),
  (9, 'The Long Signal', 'Paul Adeyemi', 'science', 2023, 254),
  (10, 'Paper Boats', 'Ruth Ebert', 'children', 2012, 48),
  (11, 'Northern Light', 'Ana Ruiz', 'fiction', 2024, 233);
INSERT INTO Loans VALUES
  (1, 3, 1, 1, DATE '2024-01-05', DATE '2024-01-19', 0.00),
  (2, 6, 1, 1, DATE '2024-02-02', DATE '2024-03-01', 2.50),
  (3, 2, 2, 1, DATE '2024-01-12', DATE '2024-01-30', 0.00),
  (4, 9, 2, 1, DATE '2024-04-03', NULL, 0.00),
  (5, 1, 3, 2, DATE '2024-02-14', DATE '2024-02-28', 0.00),
  (6, 4, 3, 2, DATE '2024-03-09', DATE '2024-04-20', 4.00),
  (7, 5, 4, 2, DATE '2024-03-15', NULL, 0.00),
  (8, 7, 5, 3, DATE '2024-01-22', DATE '2024-02-05', 0.00),
  (9, 3, 5, 3, DATE '2024-02-19', DATE '2024-03-04', 0.00),
  (10, 8, 6, 3, DATE '2024-04-01', NULL, 0.00),
  (11, 10, 7, 4, DATE '2024-03-02', DATE '2024-03-30', 1.50),
  (12, 2, 7, 4, DATE '2024-04-10', NULL, 0.00),
  (13, 6, 8, 1, DATE '2024-04-12', NULL, 0.00),
  (14, 1, 9, 4, DATE '2024-01-30', DATE '2024-02-27', 3.00),
  (15, 4, 1, 2, DATE '2024-04-15', NULL, 0.00);
